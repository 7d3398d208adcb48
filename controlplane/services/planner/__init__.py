"""The capacity planner (issue 42): how many engines each model runs in each region."""
