# References resolve across the files of a directory, in any order.
pipeline "t" {}

sink "out" {
  kind  = "stdout"
  input = stage.enrich
}
