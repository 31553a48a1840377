"""The operator console: a Textual app over a feed of rank telemetry (live links or a replay).

Link threads only fill an inbox and post one coalescing `FeedReady`; the UI thread drains it
into the `Fleet` and redraws at most `fps` times a second, so a burst never queues frames.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer

from console import snapshot
from console.feed import Feed, Inbox
from console.fleet import Fleet
from console.messages import CommandFailed, CommandSent, FeedReady, RankSelected
from console.screens import (
    ConfirmScreen,
    HelpScreen,
    QuitScreen,
    RankDetailScreen,
    RebalanceScreen,
)
from console.widgets import EventLog, LossChart, RankTable, RunHeader

HEADROOM = 0.15  # memory kept free on every rank when rebalancing

CONTROL = {"checkpoint", "pause", "rebalance", "stop"}
REPLAY = {"replay_toggle", "replay_step", "replay_faster", "replay_slower"}


class FleetApp(App[int]):
    """Watch a run; steer it only through confirmed, signed commands."""

    CSS_PATH = "app.tcss"
    TITLE = "mlx-fleet"
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("c", "checkpoint", "Checkpoint"),
        Binding("p", "pause", "Pause/Resume"),
        Binding("r", "rebalance", "Rebalance"),
        Binding("s", "stop", "Stop run"),
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
    ) -> None:
        super().__init__()
        self.feed = feed
        self.read_only = read_only or feed.replay
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
        yield Footer()

    def on_mount(self) -> None:
        header = self.header
        badges = []
        if self.feed.replay:
            badges.append("REPLAY")
        elif self.read_only or self.feed.control_problem:
            badges.append("READ-ONLY")
        header.badges = tuple(badges)
        if (problem := self.feed.control_problem) and not self.feed.replay:
            self.fleet.log(problem, "warning")
        self.feed.attach(self.inbox)
        links = getattr(self.feed, "links", [])
        if links:
            # One blocking thread per rank: size the pool for them, or ranks past the default
            # pool's few threads would wait forever for a free one.
            loop = asyncio.get_running_loop()
            loop.set_default_executor(
                ThreadPoolExecutor(max_workers=len(links) + 8, thread_name_prefix="fleet-io")
            )
            for link in links:
                self.run_worker(
                    link.run,
                    name=f"link-{link.rank}",
                    group=f"link-{link.rank}",
                    thread=True,
                    exclusive=True,
                    exit_on_error=False,
                )
        if start := getattr(self.feed, "start", None):
            start()
        if getattr(self.feed, "tick", None):
            self.set_interval(0.1, self._replay_tick)
        self.set_interval(1 / self.fps, self._frame)
        self._frame(force=True)

    def on_unmount(self) -> None:
        self.feed.close()

    # --- data in -----------------------------------------------------------------------------

    def on_feed_ready(self, _: FeedReady) -> None:
        self.fleet.absorb(self.inbox.drain())
        self._dirty = True

    def _replay_tick(self) -> None:
        self.feed.tick(0.1)  # type: ignore[attr-defined]
        self._update_replay_badge()

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
        self.log_view.add(list(self.fleet.log_lines))
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

    def _confirm_then_send(self, cmd: str, title: str, body: str, args: dict | None = None) -> None:
        if self._refuse(cmd):
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send_command(cmd, args or {})
            else:
                self.fleet.log(f"{cmd}: cancelled", "info")
                self._dirty = True

        self.push_screen(ConfirmScreen(title, body, yes=cmd.capitalize()), answered)

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
        self._confirm_then_send(
            "checkpoint",
            "Checkpoint now?",
            "Every rank saves at the next update boundary; training goes on.",
        )

    def action_pause(self) -> None:
        if self.fleet.paused:
            self._confirm_then_send(
                "resume", "Resume the run?", "Training continues from where it paused."
            )
        else:
            self._confirm_then_send(
                "pause",
                "Pause the run?",
                "Every rank stops at the next update boundary and waits (press p again to resume).",
            )

    def action_stop(self) -> None:
        self._confirm_then_send(
            "stop",
            "Stop the run?",
            "The run checkpoints at the next update boundary, then every rank exits. "
            "It can be resumed from that checkpoint.",
        )

    def action_rebalance(self) -> None:
        if self._refuse("rebalance"):
            return
        split = self.fleet.current_split()
        if any(b is None for b in split):
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

        self.push_screen(
            RebalanceScreen(split, prop, models, why, hosts, HEADROOM),  # type: ignore[arg-type]
            chosen,
        )

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
        self.push_screen(HelpScreen(replay=self.feed.replay))

    def on_rank_selected(self, msg: RankSelected) -> None:
        screen = RankDetailScreen(msg.rank)
        screen.show(self.fleet, self.clock())
        self.push_screen(screen)

    # --- replay ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in REPLAY:
            return self.feed.replay
        return not (action in CONTROL and self.feed.replay)

    def action_replay_toggle(self) -> None:
        self.feed.toggle()  # type: ignore[attr-defined]
        self._update_replay_badge()

    def action_replay_step(self) -> None:
        self.feed.step()  # type: ignore[attr-defined]
        self._update_replay_badge()

    def action_replay_faster(self) -> None:
        self.feed.speed = min(256.0, self.feed.speed * 2)  # type: ignore[attr-defined]
        self._update_replay_badge()

    def action_replay_slower(self) -> None:
        self.feed.speed = max(0.25, self.feed.speed / 2)  # type: ignore[attr-defined]
        self._update_replay_badge()

    def _update_replay_badge(self) -> None:
        self.header.badges = (self.feed.badge(),)  # type: ignore[attr-defined]
