"""Work on models: per base model a model host (a backend and its samplers, in this process or in Ray device groups:
`model_host/`, `ray_deploy/`, `deployment`), the scheduler that batches tenants' work into its calls, and the loss
programs a host runs (Tinker's loss names, uploaded custom losses: `tinker_losses`, `custom_loss/`)."""
