"""Drop-in rollout loops for the trainers people use, each one backed by the rollout service
(`rolltap serve --runner`) through `rolltap.client`:

- `rolltap.loops.verl.RolltapAgentLoop`: a verl agent loop (`AgentLoopBase`), registered as
  "rolltap"; one dataset row in, one `AgentLoopOutput` out;
- `rolltap.loops.skyrl.RolltapGenerator`: a SkyRL `GeneratorInterface`; a `GeneratorInput` in,
  a `GeneratorOutput` out;
- `rolltap.loops.slime.generate_rollout`: a slime rollout function
  (`--rollout-function-path rolltap.loops.slime.generate_rollout`); slime's sample groups in,
  the same groups filled in out.

Each module imports its framework; this package and `rolltap.loops.common` import none. Every
loop turns a row of the trainer's dataset into a rolltap task (the row's `rolltap_task`: a task
object in the JSONL shorthand, or a path on the server), runs it with the configured harness,
and hands back the token ids, loss mask and logprobs that rolltap recorded, with the verifier's
reward. A rollout can yield several trajectories (where its harness broke the token chain);
each trainer takes one sequence per sample, so the loops return the last main-line trajectory
(the one that reached the outcome the reward judges) and report how many there were.
"""
