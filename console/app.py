"""The operator console: a Textual app over a feed of rank telemetry (live links or a replay).

Link threads only fill an inbox and post one coalescing `FeedReady`; the UI thread drains it
into the `Fleet` and redraws at most `fps` times a second, so a burst never queues frames.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer

from console import events, snapshot
from console.feed import Feed, Inbox, Playback
from console.fleet import Fleet
from console.link_phase import UP
from console.messages import CommandFailed, CommandSent, FeedReady, RankSelected
from console.screens import (
    ConfirmScreen,
    HelpScreen,
    QuitScreen,
    RankDetailScreen,
    RebalanceScreen,
)
from console.widgets import EventLog, LossChart, RankTable, RunHeader
from telemetry.parallelism import FIXED_SPLIT

HEADROOM = 0.15  # memory kept free on every rank when rebalancing

LIVE = {"checkpoint", "pause", "rebalance", "stop", "reconnect", "autopilot"}  # off in a replay
REPLAY = {"replay_toggle", "replay_step", "replay_faster", "replay_slower"}  # only in one


class FleetApp(App[int]):
    """Watch a run; steer it only through confirmed, signed commands."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "mlx-fleet"
    ENABLE_COMMAND_PALETTE = False

    # Every key the help lists is in the footer too; short words, so all of them fit in 80
    # columns (the compact footer: one space between keys).
    BINDINGS = [
        Binding("c", "checkpoint", "Checkpoint"),
        Binding("p", "pause", "Pause"),
        Binding("r", "rebalance", "Rebalance"),
        Binding("s", "stop", "Stop"),
        Binding("a", "autopilot", "Autopilot"),
        Binding("l", "reconnect", "Reconnect"),
        Binding("space", "replay_toggle", "Play/Pause"),
        Binding("n", "replay_step", "Step"),
        Binding("plus,equals_sign", "replay_faster", "Faster", show=False),
        Binding("minus", "replay_slower", "Slower", show=False),
        Binding("q", "quit_console", "Quit"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(
        self,
        feed: Feed,
        *,
        read_only: bool = False,
        demo: bool = False,
        fps: float = 8.0,
        clock: Callable[[], float] = time.time,
        advice: Callable[[], str] | None = None,
    ) -> None:
        """`advice`: what to suggest when no rank answers at all (e.g. `--replay RUN`)."""
        super().__init__()
        self.feed = feed
        self.replay = feed.playback is not None
        self.read_only = read_only or self.replay
        self.demo = demo
        self.fps = fps
        self.clock = clock
        self.fleet = Fleet(feed.targets, clock=clock)
        self.inbox = Inbox(notify=lambda: self.post_message(FeedReady()))
        self._dirty = True
        self._last_chart = -1
        self._last_now = 0.0
        self.frames = 0  # redraws done (the benchmark reads this)
        self.quit_choice: str | None = None  # demo: "stop" or "leave" the run on quitting
        self.advice = advice
        self._said_nobody = False
        self._exit_after_send: str | None = None

    # --- layout and start-up -----------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # Kept by reference, not queried per frame: a timer tick that lands while the app
        # shuts down (widgets already removed) must redraw into detached widgets, not raise.
        self.header = RunHeader()
        self.table = RankTable()
        self.chart = LossChart()
        self.log_view = EventLog()
        yield self.header
        yield self.table
        with Horizontal(id="lower"):
            yield self.chart
            yield self.log_view
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self.replay:
            self.header.badges = ("REPLAY",)
        elif self.read_only or self.feed.control_problem:
            self.header.badges = ("READ-ONLY",)
        if (problem := self.feed.control_problem) and not self.replay:
            self.fleet.log(problem, "warning")
        self.feed.attach(self.inbox)
        loops = self.feed.loops()
        if loops:
            # One blocking thread per rank: size the pool for them, or ranks past the default
            # pool's few threads would wait forever for a free one.
            asyncio.get_running_loop().set_default_executor(
                ThreadPoolExecutor(max_workers=len(loops) + 8, thread_name_prefix="fleet-io")
            )
        for name, loop in loops.items():
            self.run_worker(
                loop, name=name, group=name, thread=True, exclusive=True, exit_on_error=False
            )
        self.feed.start()
        if self.replay:
            self.set_interval(0.1, self._replay_tick)
        self.set_interval(1 / self.fps, self._frame)
        self._frame(force=True)

    def on_unmount(self) -> None:
        self.feed.close()

    # --- data in -----------------------------------------------------------------------------

    def on_feed_ready(self, _: FeedReady) -> None:
        self.fleet.absorb(self.inbox.drain())
        self._dirty = True
        if not self._said_nobody and self.fleet.nobody():
            self._say_nobody()
        elif self._said_nobody and not self.fleet.nobody():
            self._said_nobody = False  # a rank answers after all: the run has started
            self.fleet.warning = ""

    def _say_nobody(self) -> None:
        """No rank answers, and none will: say so once, with what to do instead."""
        self._said_nobody = True
        advice = self.advice() if self.advice is not None else ""
        places = [(t.host, t.port) for t in self.feed.targets]
        line = events.nobody_line(places, advice)
        self.fleet.log(line, "error")
        self.fleet.warning = line

    def _replay_tick(self) -> None:
        self._play(lambda p: p.tick(0.1))

    def _frame(self, force: bool = False) -> None:
        """Redraw if anything changed (and once a second for ages and countdowns)."""
        now = self.clock()
        if not (force or self._dirty or int(now) != int(self._last_now)):
            return
        self._last_now = now
        self._dirty = False
        self.frames += 1
        self.header.info = snapshot.header(self.fleet)
        self.table.show(self.fleet, now)
        version = self.fleet.loss.version + self.fleet.evals.version * 1_000_003
        if version != self._last_chart:
            self._last_chart = version
            self.chart.set_series(self.fleet.loss.all(), self.fleet.evals.all())
        self.log_view.show(self.fleet.log_lines, self.fleet.log_version)
        top = self.screen_stack[-1] if self.screen_stack else None
        if isinstance(top, RankDetailScreen):
            top.show(self.fleet, now)

    # --- commands ----------------------------------------------------------------------------

    def _refuse(self, what: str) -> bool:
        """Say why `what` cannot be done from here, if it cannot; True when refused."""
        problem = "" if not self.read_only else "this console is read-only"
        problem = problem or self.feed.control_problem
        if problem:
            self.fleet.log(f"✗ {what}: not sent: {problem}", "error")
            self.notify(problem, title=f"{what} not sent", severity="warning")
            self._frame(force=True)
            return True
        return False

    def _fixed_split(self, what: str) -> bool:
        """Say that a tensor-parallel split cannot change, if it is one; True when so."""
        if not self.fleet.parallelism().fixed_split:
            return False
        self.fleet.log(f"✗ {what}: not sent: {FIXED_SPLIT}", "warning")
        self.notify(FIXED_SPLIT, title=f"{what} not offered", severity="warning", timeout=10)
        self._frame(force=True)
        return True

    def _confirm_then_send(self, cmd: str) -> None:
        if self._refuse(cmd):
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send_command(cmd, {})
            else:
                self.fleet.log(f"{cmd}: cancelled", "info")
                self._dirty = True

        self.push_screen(ConfirmScreen.before(cmd), answered)

    @work(thread=True, group="command", exit_on_error=False)
    def send_command(self, cmd: str, args: dict[str, Any]) -> None:
        """Send on rank 0's link (network I/O: a thread worker; the outcome comes as a message)."""
        try:
            id = self.feed.send(cmd, args)
        except Exception as e:  # every failure becomes a line in the log, never a traceback
            self.post_message(CommandFailed(cmd, args, str(e) or type(e).__name__))
        else:
            self.post_message(CommandSent(id, cmd, args))

    def on_command_sent(self, msg: CommandSent) -> None:
        self.fleet.command_sent(msg.id, msg.cmd, msg.args)
        self._frame(force=True)
        if msg.cmd == self._exit_after_send:
            self.exit(0)

    def on_command_failed(self, msg: CommandFailed) -> None:
        self._exit_after_send = None  # stay: the operator must see that the stop did not go
        self.fleet.log(f"✗ {msg.cmd}: not sent: {msg.error}", "error")
        self.notify(msg.error, title=f"{msg.cmd} not sent", severity="error")
        self._frame(force=True)

    def action_checkpoint(self) -> None:
        self._confirm_then_send("checkpoint")

    def action_pause(self) -> None:
        self._confirm_then_send("resume" if self.fleet.paused else "pause")

    def action_stop(self) -> None:
        self._confirm_then_send("stop")

    def action_autopilot(self) -> None:
        if self._refuse("autopilot"):
            return
        on = not self.fleet.autopilot
        if on and self._fixed_split("autopilot"):  # it rebalances: the trainer refuses it too
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send_command("autopilot", {"on": on})
            else:
                self.fleet.log("autopilot: cancelled", "info")
                self._dirty = True

        self.push_screen(ConfirmScreen.before("autopilot on" if on else "autopilot off"), answered)

    def action_rebalance(self) -> None:
        # Before the read-only check: no console could send this one, so say the real reason.
        if self._fixed_split("rebalance") or self._refuse("rebalance"):
            return
        split = self.fleet.split()
        if split is None:
            self.fleet.log("rebalance: not every rank has reported its batch yet", "warning")
            self._frame(force=True)
            return
        prop, models, why = snapshot.proposal(self.fleet, HEADROOM)
        hosts = [v.host for v in self.fleet.ranks]

        def chosen(new: list[int] | None) -> None:
            if new is None:
                self.fleet.log("rebalance: cancelled", "info")
                self._dirty = True
            else:
                self.send_command("rebalance", {"split": new})

        self.push_screen(RebalanceScreen(split, prop, models, why, hosts, HEADROOM), chosen)

    def action_quit_console(self) -> None:
        if not self.demo or self.fleet.stopped:
            self.exit(0)
            return

        def chosen(choice: str | None) -> None:
            self.quit_choice = choice
            if choice == "stop":
                # Leave only once the command is out: closing first would drop it unsent.
                self._exit_after_send = "stop"
                self.send_command("stop", {})
            elif choice == "leave":
                self.exit(0)

        self.push_screen(QuitScreen(), chosen)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(replay=self.replay))

    def on_rank_selected(self, msg: RankSelected) -> None:
        screen = RankDetailScreen(msg.rank)
        screen.show(self.fleet, self.clock())
        self.push_screen(screen)

    # --- replay and links ------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.replay if action in REPLAY else not (self.replay and action in LIVE)

    def _play(self, control: Callable[[Playback], None]) -> None:
        if playback := self.feed.playback:  # (the replay keys are off otherwise)
            control(playback)
            self.header.badges = (playback.badge(),)

    def action_replay_toggle(self) -> None:
        self._play(lambda p: p.toggle())

    def action_replay_step(self) -> None:
        self._play(lambda p: p.step())

    def action_replay_faster(self) -> None:
        self._play(lambda p: p.faster())

    def action_replay_slower(self) -> None:
        self._play(lambda p: p.slower())

    def action_reconnect(self) -> None:
        down = [str(v.rank) for v in self.fleet.ranks if v.phase not in UP]
        if not down:
            self.fleet.log("reconnect: every link is up", "info")
        else:
            self.feed.reconnect()
            self.fleet.log(f"reconnect: rank {', '.join(down)} trying again now", "info")
        self._frame(force=True)
