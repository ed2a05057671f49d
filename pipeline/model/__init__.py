"""The model: config.py (format v1 config), network.py (the layers), files.py (save/read a model
directory), inference.py (Model, load_model)."""
from linpipe.model.config import CONFIG_FILE, ModelConfig, expected_shapes
from linpipe.model.files import SHIPPED_MODELS, resolve_model_path, save_model
from linpipe.model.inference import Model, count_parameters, load_model
from linpipe.model.network import ModelState, init_net

__all__ = ["CONFIG_FILE", "SHIPPED_MODELS", "Model", "ModelConfig", "ModelState", "count_parameters",
           "expected_shapes", "init_net", "load_model", "resolve_model_path", "save_model"]
