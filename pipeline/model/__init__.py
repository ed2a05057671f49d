"""The model: its config, the network, its files (format v1) and the inference wrapper."""
from linpipe.model.core import (
                                CONFIG_FILE,
                                SHIPPED_MODELS,
                                Model,
                                ModelConfig,
                                ModelState,
                                count_parameters,
                                expected_shapes,
                                init_net,
                                load_model,
                                resolve_model_path,
                                save_model,
)

__all__ = ["CONFIG_FILE", "SHIPPED_MODELS", "Model", "ModelConfig", "ModelState", "count_parameters",
           "expected_shapes", "init_net", "load_model", "resolve_model_path", "save_model"]
