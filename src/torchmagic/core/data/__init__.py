"""Your own images: a folder of class folders as loaders whose transforms match the
model's weights (``loaders``), the folder's layout and checks (``folders``), and the two
transform pipelines (``transforms``). Not to be confused with ``core.training.data``,
which is about moving the batches of any loader."""

from .loaders import ClassCount, ImageFolders, LoadDataOptions, image_folders

__all__ = ["ClassCount", "ImageFolders", "LoadDataOptions", "image_folders"]
