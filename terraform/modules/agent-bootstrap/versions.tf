terraform {
  required_version = ">= 1.5"
  # No provider: the module only renders text, so every cloud's pool uses it as it is.
}
