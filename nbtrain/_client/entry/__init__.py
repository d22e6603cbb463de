"""What users call on top of launching and run: the ``nbtrain`` command, ``tune()`` and the :class:`Sweep` handle,
and the ``TorchTrainer`` shim. Below them, ``_client/launching`` starts runs and ``_client/run`` reads them;
neither imports this folder."""
