"""Host sources: plug-ins that turn a top-level inventory table (`[aws]`) into hosts, and that
launch, replace and terminate machines over a job's life (sources/base.py is the interface)."""
