
set edit:completion:arg-completer[kubectl-vm] = { |@words|
    var index = (count $words)
    set index = (- $index 1)

    put (env _CLAP_IFS="\n" _CLAP_COMPLETE_INDEX=(to-string $index) COMPLETE="elvish" kubectl-vm -- $@words) | to-lines
}

