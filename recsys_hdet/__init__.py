"""recsys-hdet: multi-task feed ranking on TorchRec with HDET."""
