"""A rank's share of the data: prepared loaders, sharded samplers and Ray Dataset shards; runs in the rank.

``loading`` prepares the user's ``DataLoader`` (every argument kept),
``sharded_sampling`` splits a sampler across ranks, and ``counted_shard`` times
a Ray Dataset shard's iterator as data wait.
"""
