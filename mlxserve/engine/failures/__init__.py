"""A row or a step that fails: a row's own code guarded so it fails alone, and a step that
raised taken again without the row that made it fail."""
