// An empty source: a target made of other targets' objects needs one (cmake/layers.cmake).
