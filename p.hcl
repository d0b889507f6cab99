pipeline "mem" {
  offload_over = "64KiB"
}
topic "in" {}
topic "out" {}
stage "identity" {
  kind   = "map"
  input  = topic.in
  output = topic.out
  
}
