# A pipeline whose test deliberately fails (pipeline.flowtest.hcl): for a Go test of flowrun test's
# failure report, exit status 1 with the location of each failed expectation and a diff.

pipeline "failing" {
  key_prefix = "failing"
}

topic "in" {
  partitions = 2
  key        = msg.id
}

stage "double" {
  kind  = "map"
  input = topic.in
  set = {
    doubled = msg.n * 2
  }
}

sink "out" {
  kind  = "stdout"
  input = stage.double
}
