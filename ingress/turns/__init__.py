"""A turn, free of HTTP, Kafka and control: the service, prompts and chains, admission, budgets,
sampling, the engine call, recording, images, metrics and tracing. Invariant: nothing here
imports :mod:`ingress.wire`, :mod:`ingress.control` or the bus
(``tests/project/test_layering.py``)."""
