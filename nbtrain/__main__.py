"""``python -m nbtrain`` is the ``nbtrain`` command."""

from nbtrain._client.cli import main

raise SystemExit(main())
