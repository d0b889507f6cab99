# The source of the traced pipeline (traced.hcl): 4 messages, each of a key of its own.

source "gen" {
  kind     = "generate"
  count    = 4
  output   = topic.in
  template = { k = "k${index}", n = index }
}
