//! `bench-hook`: the application's side of a subscribe hook for `bench
//! connect --hook` (switchboard's `hooks.subscribe_url` POSTs, Nchan's
//! `nchan_authorize_request` GETs): every request to `/hook` is answered
//! `200 {}` over keep-alive, by actix-web on one worker (an application
//! shares this machine's two cores with the server under test). It binds
//! port 0 and prints `listening on 127.0.0.1:PORT`.

use actix_web::{App, HttpResponse, HttpServer, web};

fn main() -> std::io::Result<()> {
    actix_web::rt::System::new().block_on(async {
        let server = HttpServer::new(|| {
            App::new().route(
                "/hook",
                web::route().to(|_body: web::Bytes| async {
                    HttpResponse::Ok().content_type("application/json").body("{}")
                }),
            )
        })
        .workers(1)
        .backlog(4096)
        .bind(("127.0.0.1", 0))?;
        for addr in server.addrs() {
            println!("listening on {addr}");
        }
        use std::io::Write as _;
        std::io::stdout().flush()?;
        server.run().await
    })
}
