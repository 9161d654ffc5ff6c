from traceinsight.cli import entry_point

if __name__ == "__main__":  # spawned worker processes import this module; only run when executed
    entry_point()
