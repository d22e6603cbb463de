"""A rank's share of the data: prepared loaders, sharded samplers and Ray Dataset shards; runs in the rank.

``loading`` prepares the user's ``DataLoader`` (``prepare_loader``, every argument kept),
``sharded_sampling`` splits a sampler across ranks, and ``counted_shard`` hands out a Ray
Dataset shard (``get_dataset_shard``), its iterator timed as data wait. These modules talk to the
rank's session; the rest of the rank (the worker API, the worker) never imports them.
"""
