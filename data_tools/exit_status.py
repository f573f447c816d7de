"""The exit statuses every command of the project uses (training, evaluation, data tools, the
retraining job), so that one table (docs/operations.md) serves cron, systemd and Airflow. A leaf
module of ``data_tools``, the bottom package, so that every command can import it.

=====  ==============  ==========================================================================
code   name            meaning
=====  ==============  ==========================================================================
0      OK              done: training completed; the retraining job published the newest day
1      FAILED          a run or a day failed (the registry is unchanged for it)
2      USAGE           bad command line, config or input data; nothing was written
3      DIVERGED        training stopped on a non-finite loss (after its rollbacks)
4      REJECTED        retraining: the gate rejected the newest day processed
5      NOTHING_TO_DO   retraining: no new day. Configurable: ``nothing_to_do_exit=99`` for Airflow
                       (BashOperator's ``skip_on_exit_code``), ``0`` where "nothing new" is success
6      DAMAGED         retraining: the version in service (the warm start) is damaged, a file it holds or its
                       manifest; a rerun cannot help, a rollback can (the line names the file and the version)
75     BUSY            retraining: another job holds the registry's lock (EX_TEMPFAIL: try later)
=====  ==============  ==========================================================================
"""

from enum import IntEnum


class ExitStatus(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    DIVERGED = 3
    REJECTED = 4
    NOTHING_TO_DO = 5
    DAMAGED = 6
    BUSY = 75
