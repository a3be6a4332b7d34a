"""Ground-floor value types shared by the catalog, the planner, the renderer and the shells."""
