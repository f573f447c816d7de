"""The paper's HDET (``hdet=controller``; docs/method.md): replicas at spread values, averaged every T steps, a
controller moving the shared schedule. ``engine``, ``signals``, ``statistics``, ``scheduler``, ``rounds`` know no
model; ``integration``, ``explored`` and ``warm_init`` build them into a training job. Imports nothing of the range
test."""
