"""A stand-in for ``python -m nbtrain agent`` in the lab server tests (run as a script).

It speaks the agent's protocol (one JSON list of ``nbtrain`` arguments per
line in, one ``{"ok", "output"}`` line out), records every call in
``$NBTRAIN_HOME/calls.jsonl`` and acts on the registry as the real command
does: ``stop NAME`` marks the run stopped, except runs named ``unreachable*``,
whose stop fails with a connection error, and ``crash*``, which make the agent
die; ``runs`` changes nothing.
"""

import json
import os
import sys
import time

home = os.environ["NBTRAIN_HOME"]
for line in sys.stdin:
    argv = json.loads(line)
    with open(os.path.join(home, "calls.jsonl"), "a") as calls:
        calls.write(json.dumps({"time": time.time(), "argv": argv, "pid": os.getpid()}) + "\n")
    ok, output = True, ""
    if argv[0] == "stop" and argv[1].startswith("crash"):
        sys.exit("fake agent: segmentation fault (core dumped)")
    if argv[0] == "stop" and argv[1].startswith("unreachable"):
        ok, output = False, "Cannot reach ray://127.0.0.1:1: connection refused. Is the cluster running?"
    elif argv[0] == "stop":
        path = os.path.join(home, "runs", argv[1] + ".json")
        with open(path) as f:
            run = json.load(f)
        run.update(state="stopped", ended=time.time(), updated=time.time())
        with open(path + ".tmp", "w") as f:
            json.dump(run, f)
        os.replace(path + ".tmp", path)
    print(json.dumps({"ok": ok, "output": output}), flush=True)
