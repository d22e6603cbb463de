"""``python -m nbtrain`` is the ``nbtrain`` command."""

from nbtrain._cli import main

raise SystemExit(main())
