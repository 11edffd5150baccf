"""diskless's data pipeline on Spark: the tiering job and the ``diskless`` data source."""
