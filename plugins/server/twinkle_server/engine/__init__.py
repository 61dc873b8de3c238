"""Work on models: per base model a model host (a backend and its samplers, in this process or in Ray device groups:
`model_host/`, `ray_deploy/`, `deployment`), the scheduler that batches tenants' work into its calls, and the
uploaded custom losses a host runs (`custom_loss/`). A host sees registered loss names only, never a wire API's."""
