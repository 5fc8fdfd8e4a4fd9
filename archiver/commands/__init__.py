"""tsctl's commands, by area: build (init, package, inspect, config), serving (serve, stop, predict,
bench), checks (verify, shadow, run, doctor) and export (kserve, seldon). archiver/cli.py adds them to the
``tsctl`` group; common.py and options.py hold what several share."""
