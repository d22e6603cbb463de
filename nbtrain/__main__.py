"""``python -m nbtrain`` is the ``nbtrain`` command."""

from nbtrain._client.entry.cli import main

raise SystemExit(main())
