"""Sim-to-real: what the live probes measured, as typed records (:mod:`pdlab.simreal.records`)."""
