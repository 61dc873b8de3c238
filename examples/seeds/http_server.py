# Ported from the Twinkle training guide, section "HTTP Mode / Server Setup" (server.py): a script that starts the
# training service for multi-tenant access. Substitutions, nothing else changed:
# - `twinkle` -> `twinkle_core` in imports;
# - device_type 'cuda' -> 'cpu' in both groups (the multi-tenant backend, MultiLoraTransformersModel, trains
#   data-parallel on the 'model' group's 4 ranks; the 'sampler' group is 4 sampler replicas);
# - what to serve (the listing names no model): the config file in $TWINKLE_SERVER_CONFIG (docs/deployment.md), e.g.
#       TWINKLE_SERVER_CONFIG=server.yaml python examples/seeds/http_server.py
#   The groups place every model of that file on Ray (docs/coming_from_twinkle.md).
import twinkle_core
from twinkle_core import DeviceGroup, DeviceMesh  # noqa: F401  (imported by the listing)

device_groups = [
    DeviceGroup(name='model', ranks=4, device_type='cpu'),
    DeviceGroup(name='sampler', ranks=4, device_type='cpu'),
]

twinkle_core.initialize(mode='http', groups=device_groups)

# Start server services
# Model cluster, Sampler cluster, Utility cluster
