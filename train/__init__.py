"""train: the one training process, shared by the stage that times it and the stage that runs it.

`models` builds the model from a preset, `step` is the one training step (optimizer, scaler,
`train_step`): `geodt calibrate` times exactly what `geodt run` executes. `cpulimit` and
`children` place a training process on its host (CPU quota and cores, dying with its parent);
those two are torch-free. Imports formats/ and facts/ only.
"""
