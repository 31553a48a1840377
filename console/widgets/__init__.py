"""The console's widgets, one per module."""

from console.widgets.event_log import EventLog
from console.widgets.loss_chart import LossChart
from console.widgets.rank_table import RankTable
from console.widgets.run_header import RunHeader

__all__ = ["EventLog", "LossChart", "RankTable", "RunHeader"]
