"""What train_rl.py and train_lm.py share: plain helpers a training loop calls, each imported
from the module that defines it. Importing the package loads nothing, torch included: an entry
script first calls `training.openmp.shorten_openmp_spinning`, before its other imports.

A loop uses them in this order:

    shorten_openmp_spinning()             # openmp: first, before torch loads OpenMP
    ...                                   # the other imports
    @hydra.main(...)
    @exit_on_config_error                 # config: ConfigError -> one line on stderr, exit 2
    def main(cfg):
        cfg, checkpoint = resumed_run(cfg)  # resume: checkpoint None unless resume; then cfg
                                          # is the saved run's but for RESUMABLE fields given
        check_config(cfg)                 # the trainer's: check_choice / check_positive / ...
        with ExitStack() as resources:    # closes what is opened on every way out
            dist, run_dir = start_run(resources, cfg, checkpoint)  # run: processes, threads,
                                          # heap, run directory; a resumed run's process count
            seed_everything(rank_seed(cfg.seed, dist.rank))  # seeding
            if checkpoint:                # ... and load the model and optimizer states
                restore_rng_state(checkpoint["rng"][dist.rank])
            logger = start_logging(resources, run_dir, cfg, dist.is_main, checkpoint)  # metrics
            bar = resources.enter_context(progress_bar(total, initial=step, enabled=dist.is_main))
            ...  # each log interval: logger.log(all_reduce_mean(metrics, dist), step=step)
            ...  # each checkpoint interval, on every rank (a collective):
            ...  #     gathered = gather_rank_states(dist, model, memory=state.state_dict())
            ...  # then on the main rank only:
            ...  #     save_checkpoint(run_dir, {**gathered, "step": step, "model": ...})
            ...  # last, unless eval.after_training=false: analysis.report's eval.json, curves.png

    if __name__ == "__main__":
        register_schemas()                # schemas: before Hydra composes the config
        main()
"""
