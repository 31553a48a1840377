"""The console's screens and dialogs."""

from console.screens.confirm import ConfirmScreen
from console.screens.help import HelpScreen
from console.screens.quit import QuitScreen
from console.screens.rank_detail import RankDetailScreen
from console.screens.rebalance import RebalanceScreen

__all__ = ["ConfirmScreen", "HelpScreen", "QuitScreen", "RankDetailScreen", "RebalanceScreen"]
