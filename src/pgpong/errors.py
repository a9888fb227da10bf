"""PgpongError: the one base of the errors pgpong raises on purpose.

Each error type stays in the module that raises it (ConfigError in config.py,
CheckpointError in checkpoint.py, ...) and derives from PgpongError, so that a
script or a notebook can catch them all with one `except pgpong.PgpongError`. This
module imports nothing, so every floor of the house may use it."""


class PgpongError(Exception):
    """An error pgpong raises on purpose: its message is one line saying what is wrong
    and, where it helps, what to do; the command line prints it as `pgpong: error:
    MESSAGE`. Bad input (a setting, a file, an environment id, a cluster address) raises
    one that is also a ValueError (ConfigError, CheckpointError, UnknownEnvironment,
    PlotError, RecordingError) or ClusterError; a run that cannot go on raises
    PoolError, RunWriteError or TrainingDiverged."""
