"""From a validated deployment to the plan: its types, the planner, the rendered unit and files, variables to plan."""
