"""Your own images as loaders, without a notebook: ``image_folders(path, weights)``
(see ``torchmagic.core.data``)."""

from .core.data import ClassCount, ImageFolders, LoadDataOptions, image_folders

__all__ = ["ClassCount", "ImageFolders", "LoadDataOptions", "image_folders"]
