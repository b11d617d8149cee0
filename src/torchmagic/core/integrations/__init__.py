"""Objects that live inside other libraries: found by one walk (:mod:`.discovery`), with
what each library wraps and holds answered in a small module of its own, its integration
(imported only when an object of that library is met; the libraries themselves are never
imported; :mod:`.lookup` says which integration knows an object)."""
