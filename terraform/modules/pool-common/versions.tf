terraform {
  required_version = ">= 1.5"
  # No provider: what every cloud's pool takes alike, validated once, and its boot script.
}
