"""JupyterLab settings the notebooks need: widget state saved with the notebook.

JupyterLab saves the widgets' state into a notebook only when the widget manager's ``saveState`` setting
("Save Widget State Automatically") is on, and it is off by default: a saved remediate notebook then shows
"Error displaying widget: model not found" where its review was. A notebook cannot turn the setting on
itself (it is a setting of the application, not of a notebook), but a folder on ``JUPYTER_CONFIG_PATH``
can carry it as a default (``labconfig/default_setting_overrides.json``, which JupyterLab's server reads
from every Jupyter config folder; a user's own setting still wins). :func:`write_lab_config` writes that
folder; start JupyterLab with it:

    JUPYTER_CONFIG_PATH=<folder> jupyter lab notebooks/

The record each run writes under the review (:meth:`~gatewayscope.notebook.widgets.PlanReview.show`) is
plain HTML and does not depend on this.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gatewayscope._files import read_text

#: the JupyterLab settings (plugin id -> values) the notebooks want as defaults
LAB_SETTINGS: dict[str, dict[str, Any]] = {"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True}}
#: the file JupyterLab's server reads default setting overrides from, under a Jupyter config folder
#: the most of an existing overrides file read (a settings file is a few KB; anything else is not ours to read)
SETTINGS_LIMIT = 1024 * 1024
OVERRIDES_FILE = Path("labconfig") / "default_setting_overrides.json"


def write_lab_config(folder: str | Path) -> Path:
    """Write the notebooks' JupyterLab defaults under ``folder``; return ``folder`` (for ``JUPYTER_CONFIG_PATH``).

    Settings already in the file for other plugins are kept; ours are set.
    """
    root = Path(folder)
    path = root / OVERRIDES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    current: dict[str, Any] = {}
    if path.exists():
        try:
            loaded = json.loads(read_text(path, limit=SETTINGS_LIMIT))
        except (OSError, ValueError):
            loaded = {}
        current = loaded if isinstance(loaded, dict) else {}
    for plugin, values in LAB_SETTINGS.items():
        entry = current.get(plugin)
        current[plugin] = {**(entry if isinstance(entry, dict) else {}), **values}
    path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    return root
