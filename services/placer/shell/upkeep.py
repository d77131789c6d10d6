"""Upkeep of one placer replica: the profile compiled with the learned task mix, the tenancy
file, the view's periodic refresh, reconciliation, and the cluster statistics for the
dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from services.placer.config import ConfigFileError, parse_tenancy
from services.placer.core.fragmentation import FragmentationModel, HostKind, TypicalTask
from services.placer.core.profiles import BUILTIN, DEFAULT_TYPICAL_TASKS, ProfileSpec, build_profile
from services.placer.rules import mix, stats
from services.placer.shell.context import Shell, log
from services.placer.shell.held import Held
from services.placer.shell.waiting import REFRESH_S, WaitingPods
from shared import codec, subjects


def service_profile(profile: ProfileSpec | str) -> ProfileSpec:
    """The profile as the service runs it: a built-in one breaks ties by a draw seeded by the
    pod's UID instead of by node name, so replicas (and this replica's commits in flight) that
    decide different pods at once spread over equally good nodes instead of all racing for the
    first one; deterministic for a pod, and as good as the simulator's seeded node order. A
    profile file's own ``tie_break`` is kept."""
    if isinstance(profile, ProfileSpec):
        return profile
    spec = BUILTIN[profile]
    return msgspec.structs.replace(spec, tie_break="random")


class Upkeep:
    """The replica's periodic work (see the module docstring)."""

    def __init__(self, *, shell: Shell, held: Held, waiting: WaitingPods) -> None:
        self._shell = shell
        self._held = held
        self._waiting = waiting
        self._typical: tuple[Any, ...] | None = None
        self._hosts: tuple[HostKind, ...] = ()
        """The cluster's node kinds the profile was compiled with (scarce hosts, ``fed_fgd``)."""
        self._compiled = (0, 0.0)
        """Decisions made and monotonic time at the last compile."""
        self._grown = -1
        """``ClusterView.grown`` when the node kinds were last looked at."""
        self._stats_model: tuple[tuple[TypicalTask, ...], FragmentationModel] | None = None
        self._tenancy_text: bytes | None = None

    async def refresh_loop(self) -> None:
        shell = self._shell
        while True:
            await shell.clock.sleep(REFRESH_S)
            shell.view.refresh(shell.clock.now())
            shell.poke()
            unplaceable = shell.view.unplaceable()
            shell.metrics.nodes.clear()
            shell.metrics.nodes.labels(state="placeable").set(
                shell.view.node_count() - sum(unplaceable.values())
            )
            for reason, count in unplaceable.items():
                shell.metrics.nodes.labels(state=reason).set(count)

    async def reconcile_loop(self) -> None:
        shell = self._shell
        while True:
            await shell.clock.sleep(shell.config.reconcile_interval_s)
            if not shell.restored:  # the view may hold a lost store, or a restore half done
                continue
            try:
                await shell.protocol.reconcile(grace_s=shell.config.reconcile_interval_s / 2)
            except Exception as error:
                log.warning("reconciliation failed; tried again", extra={"error": str(error)})
            self._waiting.sweep_board()

    async def mix_loop(self) -> None:
        while True:
            await self._shell.clock.sleep(self._shell.config.mix_check_s)
            self.rebuild_profile()

    @property
    def mix_compiled(self) -> bool:
        """Whether the profile in use was compiled with the task mix learned so far."""
        return self._shell.profile is not None and self._typical == self._shell.view.mix.typical()

    @property
    def hosts_compiled(self) -> tuple[HostKind, ...]:
        """The node kinds the profile in use was compiled with."""
        return self._hosts

    def follow_node_kinds(self) -> None:
        """Look at the node kinds again now if a node's capacity moved (``ClusterView.grown``),
        not at the next mix check: a replica turns ready before the nodes' inventories come, and
        the first pods it decides must be decided with the kinds, as the simulator decides them.
        Called before each decision; one comparison when nothing moved."""
        if self._shell.view.grown != self._grown:
            self.rebuild_profile()

    def rebuild_profile(self) -> None:
        """Compile the profile with the learned task mix and the cluster's node kinds (the fed
        measure weighs tasks few nodes can hold more, as the simulator does), when either moved
        and a compile is due (``mix.compile_due``)."""
        shell = self._shell
        typical = shell.view.mix.typical()
        hosts = shell.view.host_kinds()
        self._grown = shell.view.grown  # after ``host_kinds``, which may derive nodes
        decided, compiled_at = self._compiled
        now = shell.clock.monotonic()
        if shell.profile is not None and not mix.compile_due(
            moved=typical != self._typical or hosts != self._hosts,
            decisions=shell.decisions - decided,
            judgements=shell.view.index.memo_size,
            elapsed_s=now - compiled_at,
        ):
            return
        self._compiled = (shell.decisions, now)
        old = shell.profile
        shell.profile = build_profile(
            service_profile(shell.config.profile),
            typical_tasks=typical,
            hosts=hosts,
            **shell.view.tenancy.plugins(),
        )
        self._typical = typical
        self._hosts = hosts
        shell.forget_failed()
        shell.metrics.profile_builds.inc()
        if old is not None:  # its memo is of no use any more
            for index in shell.view.indexes():
                for stale in (old, *old.node_policies.values()):
                    index.memos.pop(stale, None)
                if not index.memos:
                    # Judgements are counted from this compile on (``compile_due``): left at
                    # the old memo's count, a mix moved with no decision here since (another
                    # replica's placement) waited MIX_STALE_S to be compiled.
                    index.memo_size = 0
        log.info(
            "profile compiled",
            extra={
                "profile": shell.config.profile_name,
                "pods_seen": len(shell.view.mix),
                "typical_tasks": len(typical),
                "node_kinds": len(hosts),
            },
        )

    async def stats_loop(self) -> None:
        """Publish this replica's ``ClusterStats`` (fragmentation as the core measures it) to
        KV ``tessera-stats`` for the dashboard; one key per replica, so none contend. With node
        pools only the holder of pool 0 does: the figures are the whole cluster's whoever
        computes them, and every other replica would derive every node's state to repeat them."""
        shell = self._shell
        key = subjects.stats_key(shell.config.placer_id)
        while True:
            if shell.view.pools > 1 and 0 not in shell.view.owned:
                await shell.clock.sleep(shell.config.stats_interval_s)
                continue
            typical = self._typical or DEFAULT_TYPICAL_TASKS
            if self._stats_model is None or self._stats_model[0] != typical:
                self._stats_model = (typical, FragmentationModel(typical))
            figures = stats.cluster_stats(
                shell.view.everywhere(),
                self._stats_model[1],
                placer_id=shell.config.placer_id,
                profile=shell.config.profile_name,
                typical_tasks=len(typical),
                pending_pods=len(self._held.waiting),
                pods_reserved=stats.reserved_pods(shell.view.claims, shell.view.records),
                now=shell.clock.now(),
                tenants=stats.tenant_usage(shell.view.ledgers(), shell.view.tenancy.config.quotas),
            )
            try:
                await shell.bus.kv_put(subjects.KV_STATS, key, codec.encode(figures))
            except Exception as error:  # NATS away: the next round tries again
                log.warning("cluster statistics not published", extra={"error": str(error)})
            await shell.clock.sleep(shell.config.stats_interval_s)

    async def tenancy_loop(self) -> None:
        if not self._shell.config.tenancy_file:
            return
        while True:
            await self._shell.clock.sleep(self._shell.config.tenancy_check_s)
            self.check_tenancy_file()

    def check_tenancy_file(self) -> bool:
        """Apply the tenancy file when it changed and checks; True when a new version applied."""
        shell = self._shell
        path = Path(shell.config.tenancy_file)
        try:
            text = path.read_bytes()
        except OSError as error:
            if self._tenancy_text is not None:
                log.error(
                    "cannot read the tenancy file; keeping the last good config",
                    extra={"path": str(path), "error": error.strerror},
                )
                self._tenancy_text = None
            return False
        if text == self._tenancy_text:
            return False
        self._tenancy_text = text
        try:
            config = parse_tenancy(text, source=str(path))
        except ConfigFileError as error:
            shell.metrics.tenancy_reloads.labels(outcome="refused").inc()
            log.error(
                "tenancy file refused; keeping the last good config", extra={"reason": str(error)}
            )
            return False
        if config == shell.view.tenancy.config:
            return False
        shell.view.configure_tenancy(config)
        shell.forget_failed()
        shell.poke()
        shell.metrics.tenancy_reloads.labels(outcome="applied").inc()
        log.info(
            "tenancy config applied",
            extra={
                "namespaces": len(config.namespaces),
                "groups": len(config.groups),
                "permissions": len(config.permissions),
                "quotas": len(config.quotas),
            },
        )
        return True
