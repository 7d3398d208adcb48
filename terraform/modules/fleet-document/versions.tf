terraform {
  required_version = ">= 1.9" # a validation refers to another variable
  # No provider: it renders the fleet document from what the other modules output.
}
