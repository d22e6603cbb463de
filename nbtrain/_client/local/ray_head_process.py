"""The local cluster's head process: ``python -m nbtrain._client.local.ray_head_process start --head …`` is Ray's
own ``ray start``, without the command line's other commands and without the API server a head started
without the dashboard has no use for (:func:`nbtrain._ray_compat.no_api_server_without_dashboard`: about 1 s
of the start, and a process).

Why not the ``ray`` command as it is: its module imports Serve's, the state API's and the jobs' commands before
it parses its arguments (0.8 s of its 1.3 s start on a 2-core VM, Serve's alone 0.7 s), and every other
process of the cluster starts after it. Ray imports each of them optionally (one that fails to import is left
out of the command line, logged at debug level), so naming them absent in ``sys.modules`` has ``ray start``
skip them; the rest is Ray's command as it is, by this interpreter (the ``ray`` script may be on no ``PATH``).
"""

from __future__ import annotations

import sys

OTHER_COMMANDS = ("ray.serve.scripts", "ray.util.state.state_cli", "ray.dashboard.modules.job.cli")


def main() -> None:
    for name in OTHER_COMMANDS:
        sys.modules[name] = None  # type: ignore[assignment]  # None: Python's "not importable here"
    from ray.scripts.scripts import main as ray_command

    from nbtrain._ray_compat import no_api_server_without_dashboard

    no_api_server_without_dashboard()

    sys.argv[0] = "ray"
    ray_command()


if __name__ == "__main__":
    main()
