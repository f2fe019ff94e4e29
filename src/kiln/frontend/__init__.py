"""Model frontends: each turns a model format into kiln's network IR."""
