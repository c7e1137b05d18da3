complete --keep-order --exclusive --command kubectl-vm --arguments "(COMPLETE=fish kubectl-vm -- (commandline --current-process --tokenize --cut-at-cursor) (commandline --current-token))"
