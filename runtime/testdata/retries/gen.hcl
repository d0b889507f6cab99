# The source of the retries pipeline (retries.hcl): 60 messages over 4 keys.

source "gen" {
  kind     = "generate"
  count    = 60
  output   = topic.in
  template = { key = "k${index % 4}", seq = index, run = var.run }
}
