"""Where each step of a run stands in its schedules (learning rate, momentum, attention window): its own from step
0, or, with --init-schedule continue, the schedule of the checkpoint it starts from (docs/dlo.md)."""

from speedrun.errors import UsageError

INIT_SCHEDULES = ("restart", "continue")


def schedule_origin(init_schedule, init_state, path):
    """[step, schedule length] of the checkpoint a continued run starts from; None when the schedule restarts."""
    if init_schedule != "continue" or init_state is None:
        return None
    try:
        done, length = int(init_state["step"]), int(init_state["config"]["num_iterations"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: checkpoint records no schedule position (step and num_iterations), "
                         f"needed by --init-schedule continue") from None
    if not 0 <= done <= length:
        raise UsageError(f"{path}: checkpoint step {done} is outside its schedule of {length} steps")
    return [done, length]


def schedule_clock(origin, num_iterations):
    """Where each step of a run stands in its learning-rate, momentum and attention-window schedules: a function
    step -> (schedule step, schedule length), at which the track evaluates its schedule functions.

    No origin (restart, and every run without --init-from): (step, num_iterations), the run's own schedule.
    origin [s, S] (continue): the checkpoint's own schedule, from where it stopped (step s of S). The run's N steps
    cover the remaining S - s schedule steps evenly: step t -> (s + (S - s) t / N, S). Step 0 is exactly the
    checkpoint's position (same window, same learning rate); step N is the schedule's end; with N == S - s it is
    step s + t, the schedule the checkpoint's own run would have followed. A checkpoint at its schedule's end
    (s == S) stays there: final window, final (lowest) learning rate."""
    if origin is None:
        return lambda step: (step, num_iterations)
    done, length = origin
    return lambda step: (done + (length - done) * step / num_iterations, length)


def run_schedule_clock(args, init_state, resume_state):
    """The schedule clock of a run (schedule_clock). The origin goes into args, hence into the run's config line and
    checkpoints, so that a resumed run keeps the schedule it started with."""
    args.init_schedule_origin = (resume_state["config"].get("init_schedule_origin") if resume_state is not None
                                 else schedule_origin(args.init_schedule, init_state, args.init_from))
    return schedule_clock(args.init_schedule_origin, args.num_iterations)
