"""A simulated SGLang worker with a roofline performance model (see README.md).

Entry points: ``proxy.sim.config.SimConfig``, ``proxy.sim.server.SimWorker`` (one worker on this
loop), ``proxy.sim.fleet.Fleet`` (several, in-process or one OS process each), and
``python -m proxy.sim`` / ``radixgate sim`` (one worker process, SGLang-style flags).
"""
