"""What users call on top of launching and run: ``launch()``, ``attach()`` and ``runs()``, the ``nbtrain``
command, ``tune()`` and the :class:`Sweep` handle, and the ``TorchTrainer`` shim. Below them,
``_client/launching`` starts runs and ``_client/run`` reads them (and forks them, through launching);
neither imports this folder."""
