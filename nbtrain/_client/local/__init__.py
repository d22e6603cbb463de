"""The embedded local cluster: a Ray head on 127.0.0.1 started, found, checked and stopped for a
home directory (:mod:`.local_cluster`, :mod:`.local_head`), and the extra loopback nodes
``nbtrain cluster add-node`` starts (:mod:`.local_nodes`, :mod:`.local_node_process`).

Runs in the notebook kernel and the ``nbtrain`` CLI.
"""
