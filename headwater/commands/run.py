"""``headwater run``: the whole pipeline, until caught up or supervised."""

from __future__ import annotations

import contextlib
import signal
from types import FrameType

import click

from headwater.cli_context import Context, StageOptions, config_option, once_or_follow, pass_context, stage_options
from operations.pipeline import Supervisor, follow_stages, run_until_caught_up


@click.command("run")
@config_option
@once_or_follow(
    "until-caught-up",
    once_help="Everything committed before start through every stage.",
    follow_help="Supervised capture, feeds and loads until Ctrl-C / SIGTERM (they die with it, even on SIGKILL).",
)
@stage_options
@pass_context
def run_command(context: Context, follow: bool, options: StageOptions) -> None:
    """Capture + feeds + warehouse loads, in dependency order."""
    from headwater.stage_runtime import StageRuntime
    from operations.pipeline_metrics import Scope

    output = options.output("run")
    config = context.config()
    if not follow:
        runtime = StageRuntime(config, options, output, "headwater run")
        runtime.feeds, runtime.tables = tuple(config.feeds), tuple(config.warehouse.tables)
        runtime.serve(Scope.everything(config))
        with runtime.recording(follow=False):
            run_until_caught_up(
                config,
                say=output.info,
                holder_wait=options.holder_wait(output, follow=False),
                on_capture=runtime.observe_capture,
                on_query=runtime.follow_query,
            )
        return
    assert config.config_path is not None
    from core import stop_request

    with contextlib.ExitStack() as stack:
        if options.metrics_port is not None:
            from headwater.stage_runtime import children_record_metrics

            stack.enter_context(children_record_metrics())
        stages = follow_stages(config, config.config_path, ["--log-format", options.log_format])
        supervisor = Supervisor(stages, say=output.note)
        if options.metrics_port is not None:
            from operations.pipeline_metrics import stage_restarts

            runtime = StageRuntime(config, options, output, "headwater run")
            runtime.serve(
                Scope.everything(config), stage_restarts(lambda: [(s.name, s.restarts_total) for s in stages])
            )

        def stop(_signum: int, _frame: FrameType | None) -> None:
            supervisor.stop()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        if stop_request.requested.is_set():  # asked before the handlers above: start nothing
            supervisor.stop()
        code = supervisor.run()
    raise SystemExit(code)


def register(cli: click.Group) -> None:
    """Attach the ``run`` command."""
    cli.add_command(run_command)
