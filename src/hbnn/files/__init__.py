"""Files: atomic, committed-together outputs and checked loading (``io``), traces (``trace``), and the checksums that
let readers tell a file is as its stage wrote it (``integrity``)."""
