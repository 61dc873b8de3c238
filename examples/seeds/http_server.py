# Ported from the Twinkle training guide, section "HTTP Mode / Server Setup" (server.py): a script that starts the
# training service for multi-tenant access. Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - GPU counts -> CPU ranks: the 'model' group 4 x cuda -> 1 x cpu (the multi-tenant backend,
#   MultiLoraTransformersModel, trains on one rank), the 'sampler' group 4 x cuda -> 2 x cpu (two sampler replicas);
# - what to serve (the listing names no model): the config file in $TWINKLE_SERVER_CONFIG (docs/deployment.md), e.g.
#       TWINKLE_SERVER_CONFIG=server.yaml python examples/seeds/http_server.py
#   The groups place every model of that file on Ray (docs/coming_from_twinkle.md).
import twinkle_core
from twinkle_core import DeviceGroup, DeviceMesh  # noqa: F401  (imported by the listing)

device_groups = [
    DeviceGroup(name='model', ranks=1, device_type='cpu'),
    DeviceGroup(name='sampler', ranks=2, device_type='cpu'),
]

twinkle_core.initialize(mode='http', groups=device_groups)

# Start server services
# Model cluster, Sampler cluster, Utility cluster
