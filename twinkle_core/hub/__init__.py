"""Hub-loadable components (docs/architecture.md §7): references, manifests, integrity pins, trusted loading,
publishing.

Only light modules are imported here; the hub clients (modelscope, huggingface_hub) load on first download.
"""

from twinkle_core.hub.integrity import folder_sha256
from twinkle_core.hub.loader import load_hub_component
from twinkle_core.hub.manifest import ComponentSpec, Manifest, read_manifest
from twinkle_core.hub.ref import HubRef, is_hub_ref

__all__ = ['ComponentSpec', 'HubRef', 'Manifest', 'folder_sha256', 'is_hub_ref', 'load_hub_component', 'read_manifest']
