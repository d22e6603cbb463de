"""Reaching a cluster from the notebook: what an address names, the token and TLS it needs, the versions
both sides must share, what a failed connection says, the cluster's nodes by name, and short tasks on its
head node. :mod:`.connection` is the ``Cluster`` handle ``connect()`` returns."""
